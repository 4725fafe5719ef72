"""Words every layer shares: typed errors and exit statuses, text, log lines, secret masking."""
