"""The checker: run any attention implementation through the articles' tests and name the bug."""
