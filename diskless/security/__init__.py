"""Security: the cluster secret internal connections prove, SASL, TLS and ACLs."""
