# Open minutes live in Redis with the partition: a process that dies loses none of them, and the one
# that takes the partition over goes on with them, with nothing to restore.

run "a minute stays open through a crash" {
  send {
    source = source.orders
    messages = [
      { order_id = "ord-1", customer_id = "alice", amount = 12.5, user_id = "u1", created_at = "2026-03-01T09:00:05Z" },
      { order_id = "ord-3", customer_id = "alice", amount = 7.5, user_id = "u2", created_at = "2026-03-01T09:00:40Z" },
    ]
  }
  step {
    crash = true
  }
  step {
    send {
      source = source.orders
      messages = [
        { order_id = "ord-3", customer_id = "alice", amount = 7.5, user_id = "u2", created_at = "2026-03-01T09:00:40Z" },
        { order_id = "ord-6", customer_id = "alice", amount = 20, user_id = "u1", created_at = "2026-03-01T09:01:30Z" },
      ]
    }
  }
  expect {
    sink = sink.revenue
    messages = [
      { key = "alice", orders = 2, revenue = 20, buyers = 2, biggest = 12.5, first = "ord-1", window = { start = "2026-03-01T09:00:00Z", end = "2026-03-01T09:01:00Z" } },
    ]
  }
}
