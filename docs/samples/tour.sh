foqsctl enqueue --ns tour --topic jobs --priority 5 --payload 'resize cat.png'
foqsctl enqueue --ns tour --topic jobs --priority 1 --payload 'resize dog.png'
foqsctl dequeue --ns tour --topic jobs --count 1 --wait 5000 --json   # the most urgent, leased
foqsctl stats --ns tour --topic jobs                                  # ready=1 leased=1 ...
# A worker instead of a loop: one command per item, the payload on stdin; exit 0 acks.
timeout --preserve-status -s TERM 3 foqsctl work --ns tour --topic jobs --concurrency 2 -- sh -c 'cat; echo'
foqsctl stats --ns tour --topic jobs --json
