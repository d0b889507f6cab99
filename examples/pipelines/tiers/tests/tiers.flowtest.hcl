# The tiers example under test: each order gets its customer's record as it was at the order's
# created_at, whatever arrives first. An order waits until the table's watermark has passed its
# time; when no more changes come, a partition of the table that has been idle for a minute moves
# its watermark on with the (virtual) clock, which advance makes pass.

run "each order gets the record that held when it was placed" {
  send {
    source = source.customers
    file   = "../data/customers.jsonl"
  }
  send {
    source = source.orders
    file   = "../data/orders.jsonl"
  }
  advance = "5m"
  expect {
    sink  = sink.out
    match = "unordered"
    messages = [
      { order_id = "o1", customer_id = "c1", amount = 30, created_at = "2026-03-01T09:01:00Z", customer = { customer_id = "c1", tier = "bronze", updated_at = "2026-03-01T09:00:00Z" } },
      { order_id = "o2", customer_id = "c1", amount = 12, created_at = "2026-03-01T09:03:00Z", customer = { customer_id = "c1", tier = "silver", updated_at = "2026-03-01T09:02:00Z" } },
      { order_id = "o3", customer_id = "c1", amount = 7, created_at = "2026-03-01T09:05:00Z", customer = { customer_id = "c1", tier = "gold", updated_at = "2026-03-01T09:04:00Z" } },
      { order_id = "o4", customer_id = "c2", amount = 99, created_at = "2026-03-01T09:04:29Z", customer = { customer_id = "c2", tier = "silver", updated_at = "2026-03-01T09:00:00Z" } },
      { order_id = "o5", customer_id = "c3", amount = 5, created_at = "2026-03-01T09:00:30Z", customer = null },
      { order_id = "o6", customer_id = "c2", amount = 41, created_at = "2026-03-01T09:04:30Z", customer = { customer_id = "c2", tier = "gold", updated_at = "2026-03-01T09:04:30Z" } },
    ]
  }
  assert {
    condition     = metrics["customers.table"].absorbed == 6 && metrics.priced.absorbed == 6
    error_message = "the table takes in every record, and every order waits in the lookup's state"
  }
}

run "an order that comes before the changes gets the one that held at its time" {
  reset = true
  step {
    send {
      source   = source.orders
      messages = [{ order_id = "o7", customer_id = "c3", amount = 3, created_at = "2026-03-01T09:03:00Z" }]
    }
  }
  step {
    send {
      source = source.customers
      messages = [
        { customer_id = "c3", tier = "silver", updated_at = "2026-03-01T09:02:00Z" },
        { customer_id = "c3", tier = "gold", updated_at = "2026-03-01T09:04:00Z" },
        { customer_id = "c1", tier = "gold", updated_at = "2026-03-01T09:04:00Z" },
      ]
    }
    advance = "5m"
  }
  expect {
    sink     = sink.out
    messages = [{ order_id = "o7", customer_id = "c3", amount = 3, created_at = "2026-03-01T09:03:00Z", customer = { customer_id = "c3", tier = "silver", updated_at = "2026-03-01T09:02:00Z" } }]
  }
}

run "a waiting order survives a crash" {
  step {
    send {
      source   = source.orders
      messages = [{ order_id = "o8", customer_id = "c2", amount = 8, created_at = "2026-03-01T09:20:00Z" }]
    }
  }
  step {
    crash = true
  }
  step {
    send {
      source   = source.customers
      messages = [{ customer_id = "c2", tier = "bronze", updated_at = "2026-03-01T09:15:00Z" }]
    }
    advance = "20m"
  }
  expect {
    sink     = sink.out
    messages = [{ order_id = "o8", customer_id = "c2", amount = 8, created_at = "2026-03-01T09:20:00Z", customer = { customer_id = "c2", tier = "bronze", updated_at = "2026-03-01T09:15:00Z" } }]
  }
}
