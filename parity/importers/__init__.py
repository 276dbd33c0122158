"""Importers: acceptance measured by other engines, as records the gate compares."""
