"""The int8 host format: the reference bytes (`reference`) and the codec a row table
carries (`codec`)."""
