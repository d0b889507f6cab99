# The shop's order events, as its application XADDs them: every field is a string. Both consumers
# see every event: notifications tells the customer (except of order.placed), analytics records it.

run "both consumers see every event, each order's in order" {
  # Three orders, their events interleaved as the shop appends them.
  send {
    source = source.shop
    messages = [
      { type = "order.placed", order_id = "1001", customer = "alice", amount = "42.50" },
      { type = "order.placed", order_id = "1002", customer = "bob", amount = "9.99" },
      { type = "order.paid", order_id = "1001", customer = "alice", amount = "42.50" },
      { type = "order.placed", order_id = "1003", customer = "carol", amount = "120" },
      { type = "order.shipped", order_id = "1001", customer = "alice", amount = "42.50" },
      { type = "order.cancelled", order_id = "1002", customer = "bob", amount = "9.99" },
      { type = "order.paid", order_id = "1003", customer = "carol", amount = "120" },
    ]
  }
  # Keyed by order: the events of one order reach the customer in the order they happened.
  # Shipping news goes by SMS, the rest by email; an order.placed is not notified at all.
  expect {
    sink = sink.notify
    messages = [
      { key = "1001", payload = { type = "order.paid", order_id = "1001", customer = "alice", channel = "email", to = "alice", text = "Your order 1001 is paid." } },
      { key = "1001", payload = { type = "order.shipped", order_id = "1001", customer = "alice", channel = "sms", to = "alice", text = "Your order 1001 is on its way." } },
      { key = "1002", payload = { type = "order.cancelled", order_id = "1002", customer = "bob", channel = "email", to = "bob", text = "Your order 1002 is cancelled." } },
      { key = "1003", payload = { type = "order.paid", order_id = "1003", customer = "carol", channel = "email", to = "carol", text = "Your order 1003 is paid." } },
    ]
  }
  # Analytics records every event, placed ones included, with the amount in whole cents.
  expect {
    sink = sink.reporting
    messages = [
      { key = "1001", payload = { order_id = "1001", customer = "alice", event = "order.placed", amount_cents = 4250, cancelled = false } },
      { key = "1001", payload = { order_id = "1001", customer = "alice", event = "order.paid", amount_cents = 4250, cancelled = false } },
      { key = "1001", payload = { order_id = "1001", customer = "alice", event = "order.shipped", amount_cents = 4250, cancelled = false } },
      { key = "1002", payload = { order_id = "1002", customer = "bob", event = "order.placed", amount_cents = 999, cancelled = false } },
      { key = "1002", payload = { order_id = "1002", customer = "bob", event = "order.cancelled", amount_cents = 999, cancelled = true } },
      { key = "1003", payload = { order_id = "1003", customer = "carol", event = "order.placed", amount_cents = 12000, cancelled = false } },
      { key = "1003", payload = { order_id = "1003", customer = "carol", event = "order.paid", amount_cents = 12000, cancelled = false } },
    ]
  }
  assert {
    condition     = metrics.notifications.out == 7 && metrics.notify.filtered == 3
    error_message = "the notifications stage words all seven events; the notify sink leaves out the three order.placed"
  }
}

run "amounts are rounded to the nearest cent" {
  send {
    source = source.shop
    messages = [
      { type = "order.placed", order_id = "2001", customer = "dave", amount = "0.105" },
      { type = "order.placed", order_id = "2002", customer = "erin", amount = "19.994" },
      { type = "order.placed", order_id = "2003", customer = "frank", amount = "7" },
    ]
  }
  expect {
    sink  = sink.reporting
    match = "unordered"
    messages = [
      { order_id = "2001", customer = "dave", event = "order.placed", amount_cents = 11, cancelled = false },
      { order_id = "2002", customer = "erin", event = "order.placed", amount_cents = 1999, cancelled = false },
      { order_id = "2003", customer = "frank", event = "order.placed", amount_cents = 700, cancelled = false },
    ]
  }
}
