"""RelayDecode: decode at once, hand the eager tokens to MainDecode on its READY, then stop."""
