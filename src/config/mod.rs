//! Configuration layers (managed, user, repo), their schema and validation with file:line:col
//! errors, repo trust by content hash, and the identity file.
