"""Local test hosts: real Debian systems with systemd (debootstrap + systemd-nspawn), each in a network
namespace of its own on a private bridge, reached over ssh. Nothing here ever leaves this machine
except apt-cacher-ng's fetches from the Debian mirror this machine already uses."""
