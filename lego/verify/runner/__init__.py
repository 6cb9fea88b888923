"""Files copied into the grading container and run there (standard library and pytest only)."""
