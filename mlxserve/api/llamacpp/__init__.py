"""llama.cpp's native routes, so editors' llama.cpp providers work as is."""
