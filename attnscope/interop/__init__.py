"""attnscope's results in other tools: each module adapts one tool, which it imports only when it is used."""
