"""The command line: argument parsing, the verbs, and the tables it renders; the only place
where errors become messages and exit codes."""
