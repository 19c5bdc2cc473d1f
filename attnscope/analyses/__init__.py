"""One analysis per command: settings checked on construction, `run(model, texts, progress)` returning a typed
result that the output layer renders."""
