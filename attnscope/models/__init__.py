"""Models: the families attnscope reads (where each keeps its attention and output projection) and loading."""
