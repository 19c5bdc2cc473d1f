"""The flow of data: texts (inputs) -> token windows and batches (tokens) -> the model's forward with attention
captured block by block (capture) -> reducers that keep sums, never maps (reducers); distributed runs."""
