"""What other libraries' objects wrap and where they keep things, one room per library."""
