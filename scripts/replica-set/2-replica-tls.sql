-- With TLS between the servers (then set replication.repl_ssl_ca to the same file): on
-- each replica, after the above.
STOP SLAVE;
CHANGE MASTER TO MASTER_SSL = 1, MASTER_SSL_CA = '@CA_FILE@', MASTER_SSL_VERIFY_SERVER_CERT = 1;
START SLAVE;
