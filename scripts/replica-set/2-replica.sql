-- On each other server of the set: replicate from the first primary, from its first
-- transaction on.
STOP SLAVE;
CHANGE MASTER TO MASTER_HOST = '@PRIMARY_HOST@', MASTER_PORT = @PRIMARY_PORT@,
  MASTER_USER = 'foqs_repl', MASTER_PASSWORD = '@REPL_PASSWORD@',
  MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1, MASTER_HEARTBEAT_PERIOD = 0.25;
START SLAVE;
