-- On the first primary, once every replica replicates: the primary side of semi-sync on,
-- writable. SHOW STATUS LIKE 'Rpl_semi_sync_master_clients' then counts the replicas.
SET GLOBAL rpl_semi_sync_master_enabled = ON;
SET GLOBAL read_only = OFF;
