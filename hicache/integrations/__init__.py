"""Adapters that plug hicache into existing inference servers (each imports its server lazily)."""
