# The revenue example under test: a minute is reported once the orders' times have moved 10 seconds
# past its end (a test runs the pipeline as a service, so the last minutes stay open until a later
# order closes them).

run "the export, deduplicated and summed per customer and minute" {
  send {
    source = source.orders
    file   = "../data/orders.jsonl"
  }
  expect {
    sink  = sink.revenue
    file  = "golden/closed-minutes.jsonl"
    match = "unordered"
  }
  expect {
    sink     = sink.late
    messages = [{ order_id = "ord-13", customer_id = "alice", amount = 3, user_id = "u4", created_at = "2026-03-01T09:00:30Z" }]
  }
  assert {
    condition     = metrics.orders_once.duplicates == 1 && metrics.orders_once.dropped == 1 && metrics.revenue_per_minute.late == 1 && metrics.revenue_per_minute.dropped == 0
    error_message = "the order the shop sent twice counts once (the copy is dropped), and the order from 09:00 that came after 09:02 is late (and goes to late_orders)"
  }
}

run "a later order closes the minutes still open" {
  send {
    source   = source.orders
    messages = [{ order_id = "ord-14", customer_id = "carol", amount = 2, user_id = "u9", created_at = "2026-03-01T09:06:00Z" }]
  }
  expect {
    sink  = sink.revenue
    match = "unordered"
    messages = [
      { key = "alice", orders = 1, revenue = 5, buyers = 1, biggest = 5, first = "ord-12", window = { start = "2026-03-01T09:04:00Z", end = "2026-03-01T09:05:00Z" } },
      { key = "bob", orders = 1, revenue = 25, buyers = 1, biggest = 25, first = "ord-11", window = { start = "2026-03-01T09:04:00Z", end = "2026-03-01T09:05:00Z" } },
    ]
  }
}

run "an order resent the next day is a new order" {
  send {
    source = source.orders
    messages = [
      { order_id = "ord-20", customer_id = "dave", amount = 8, user_id = "u5", created_at = "2026-03-01T09:06:05Z" },
      { order_id = "ord-20", customer_id = "dave", amount = 8, user_id = "u5", created_at = "2026-03-01T09:06:20Z" },
      { order_id = "ord-20", customer_id = "dave", amount = 8, user_id = "u5", created_at = "2026-03-02T09:06:05Z" },
    ]
  }
  expect {
    sink  = sink.revenue
    match = "subset"
    messages = [
      { key = "dave", orders = 1, revenue = 8, buyers = 1, biggest = 8, first = "ord-20", window = { start = "2026-03-01T09:06:00Z", end = "2026-03-01T09:07:00Z" } },
    ]
  }
  assert {
    condition     = metrics.orders_once.dropped == 1 && metrics.orders_once.out == 2 && metrics.revenue_per_minute.absorbed == 2
    error_message = "the copy 15 seconds later is dropped, the one a day later is not; both others go into windows"
  }
}
