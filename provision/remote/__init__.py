"""Day-2 work on the hosts: connections, the safe switch of the serving config, status, logs, discovery."""
