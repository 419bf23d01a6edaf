"""bench-compare: time and validate any engine side by side with llama.cpp."""
