"""WAL file manager service (issue 5): deletes WAL objects no partition references."""
