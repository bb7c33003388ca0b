"""The native layer: the only code of localgen that talks to llama.cpp through the bindings (llama_cpp).
The engine above it works with what these modules return: Python values and small typed records."""
