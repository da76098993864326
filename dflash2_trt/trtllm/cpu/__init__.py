"""CPU engine backend: runs the engines' networks on the CPU, the plugins through their CPU builds."""
