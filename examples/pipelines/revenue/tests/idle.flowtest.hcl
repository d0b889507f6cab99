# Run as a service, a partition that gets no more orders moves its watermark on with the clock once
# it has been idle for the stage's idle_timeout (a minute), so that its last minutes are reported
# without waiting for the next order.

run "the last minutes close when the orders stop" {
  send {
    source = source.orders
    file   = "../data/orders.jsonl"
  }
  advance = "5m"
  expect {
    sink  = sink.revenue
    count = 11
  }
  expect {
    sink  = sink.revenue
    match = "subset"
    messages = [
      { key = "alice", orders = 1, revenue = 5, buyers = 1, biggest = 5, first = "ord-12", window = { start = "2026-03-01T09:04:00Z", end = "2026-03-01T09:05:00Z" } },
      { key = "bob", orders = 1, revenue = 25, buyers = 1, biggest = 25, first = "ord-11", window = { start = "2026-03-01T09:04:00Z", end = "2026-03-01T09:05:00Z" } },
    ]
  }
}

run "a partition that has just gone quiet keeps its last minute open" {
  reset = true
  send {
    source = source.orders
    file   = "../data/orders.jsonl"
  }
  advance = "30s"
  expect {
    sink  = sink.revenue
    count = 9
  }
}
