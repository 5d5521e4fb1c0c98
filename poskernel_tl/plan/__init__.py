"""What a measurement runs with: its configuration dataclasses, its memory plan (batch
size, layer blocks) and what Track B holds and costs by path."""
