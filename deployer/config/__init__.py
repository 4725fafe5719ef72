"""What the user asked for, with no I/O: the inventory schema and parser, the roles, the plan."""
