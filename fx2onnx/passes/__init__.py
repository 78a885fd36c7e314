"""FX passes that run between capture and translation."""
