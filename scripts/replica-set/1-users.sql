-- On the set's first primary (started read-only, as every server), before any replica
-- replicates from it: the accounts then reach every server by replication.
CREATE USER 'foqs'@'@CLIENTS@' IDENTIFIED BY '@FOQS_PASSWORD@';
GRANT ALL PRIVILEGES ON `foqs%`.* TO 'foqs'@'@CLIENTS@';
CREATE USER 'foqs_repl'@'@CLIENTS@' IDENTIFIED BY '@REPL_PASSWORD@';
GRANT REPLICATION SLAVE ON *.* TO 'foqs_repl'@'@CLIENTS@';
CREATE USER 'foqs_admin'@'@CLIENTS@' IDENTIFIED BY '@ADMIN_PASSWORD@';
GRANT READ_ONLY ADMIN, RELOAD, PROCESS, SLAVE MONITOR, REPLICATION SLAVE ADMIN,
      REPLICATION MASTER ADMIN, BINLOG MONITOR, CONNECTION ADMIN ON *.* TO 'foqs_admin'@'@CLIENTS@';
GRANT SELECT ON `foqs%`.* TO 'foqs_admin'@'@CLIENTS@';
