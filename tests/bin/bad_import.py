import no_such_module_for_ftrun_tests  # noqa: F401
