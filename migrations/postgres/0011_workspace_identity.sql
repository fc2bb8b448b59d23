-- A workspace root is held by identity: the device and inode of the root folder, recorded
-- when the workspace is registered (or re-registered by an admin), as "<dev>:<ino>".
-- A root whose identity no longer matches (replaced, swapped for a symlink, moved) makes
-- the workspace's tools unavailable (`workspace_changed`) until it is re-registered.
-- root_registered_at is when that identity was recorded: calls frozen before it are refused.
-- NULL on rows from before this migration: the server records the identity it finds at
-- its next start.
ALTER TABLE workspaces ADD COLUMN root_identity TEXT;
ALTER TABLE workspaces ADD COLUMN root_registered_at TEXT;
