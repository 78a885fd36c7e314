"""The metadata a node made to replace another inherits from it: where in the user's code
it comes from, and in which module call (what diagnostics and module functions read)."""

SOURCE_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node")
