"""A package of one's own, to show ``attnlab check mypackage.layers:attend`` run from the folder that holds it."""
