"""Developer scripts; a package so that tests and benchmarks can import the broker helper."""
