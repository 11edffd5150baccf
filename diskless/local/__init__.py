"""Local development cluster: server process wrappers and the ``diskless dev`` launcher."""
