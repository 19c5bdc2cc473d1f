"""Pure maths of attention maps: the catalog of scores and roles, kinds of attention, row and pair statistics,
roles, grouping, and the from-scratch reference attention. Imports nothing of the model or the pipeline."""
