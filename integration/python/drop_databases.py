"""Drops the shard databases a test run created: drop_databases.py URL PREFIX COUNT."""

import sys
from urllib.parse import urlparse

import pymysql

url, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
u = urlparse(url)
conn = pymysql.connect(host=u.hostname, port=u.port or 3306, user=u.username or "root", password=u.password or "")
with conn.cursor() as cur:
    for i in range(count):
        cur.execute(f"DROP DATABASE IF EXISTS `{prefix}{i}`")
conn.close()
