"""Command-line layer: parses, validates, reports. The library below it never prints."""
