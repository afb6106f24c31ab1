"""Control protocol, operator client and verification tools."""
