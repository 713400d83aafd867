"""The copy backends: the `CopyBackend` interface and every way rows move (kernel, DMA,
copy engine, torch reference, int8 conversion, ``auto``)."""
