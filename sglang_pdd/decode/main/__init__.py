"""MainDecode: take relayed requests over from RelayDecode by token IDs and one EXTEND step."""
