"""The router's view of MainDecode's prefix cache."""
