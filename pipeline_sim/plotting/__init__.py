"""Drawing of computed results. Only this package imports matplotlib."""
