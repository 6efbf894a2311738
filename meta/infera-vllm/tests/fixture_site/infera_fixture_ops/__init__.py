"""Op wheels that fail in every way the plugin must contain (a test-only distribution, put on sys.path by the tests)."""
