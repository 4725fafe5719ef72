"""Getting the code to the hosts: the content-store push and the fan-out between hosts."""
