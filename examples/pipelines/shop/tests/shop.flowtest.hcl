# The shop example under test: flowrun test stands in for the sql sink, so what these runs expect at
# sink.orders_db is what it would write, a row per message, with no database. The requests' framing
# and refusals are the http_server kind's own tests, the rows in PostgreSQL the end-to-end test's
# (runtime/examples_test.go).

run "orders become rows with their customer" {
  send {
    source = source.customers
    file   = "../data/customers.jsonl"
  }
  step {
    send {
      source = source.webhooks
      messages = [
        { event = "order.created", order_id = "o1", customer_id = "c1", amount = 30, at = "2024-05-01T10:00:00Z" },
        { event = "order.created", order_id = "o2", customer_id = "c2", amount = 12.5, at = "2024-05-01T10:01:00Z" },
        { event = "order.paid", order_id = "o1", customer_id = "c1", amount = 30, at = "2024-05-01T10:02:00Z" },
        { event = "order.created", order_id = "o3", customer_id = "c9", amount = 7, at = "2024-05-01T10:03:00Z" },
      ]
    }
  }
  expect {
    sink  = sink.orders_db
    match = "unordered"
    messages = [
      { order_id = "o1", status = "created", customer_id = "c1", customer_name = "Ada Lovelace", tier = "gold", amount = 30, at = "2024-05-01T10:00:00Z" },
      { order_id = "o2", status = "created", customer_id = "c2", customer_name = "Grace Hopper", tier = "gold", amount = 12.5, at = "2024-05-01T10:01:00Z" },
      { order_id = "o1", status = "paid", customer_id = "c1", customer_name = "Ada Lovelace", tier = "gold", amount = 30, at = "2024-05-01T10:02:00Z" },
      { order_id = "o3", status = "created", customer_id = "c9", customer_name = null, tier = null, amount = 7, at = "2024-05-01T10:03:00Z" },
    ]
  }
  assert {
    condition     = metrics["customers.table"].absorbed == 5 && metrics.webhooks.out == 4 && metrics.orders_db.in == 4
    error_message = "the table takes in every customer record, and every event reaches the sink"
  }
}

run "an order's events reach the sink in their order" {
  send {
    source = source.customers
    file   = "../data/customers.jsonl"
  }
  step {
    send {
      source = source.webhooks
      messages = [
        { event = "order.created", order_id = "o7", customer_id = "c4", amount = 99, at = "2024-05-01T11:00:00Z" },
        { event = "order.paid", order_id = "o7", customer_id = "c4", amount = 99, at = "2024-05-01T11:05:00Z" },
        { event = "order.shipped", order_id = "o7", customer_id = "c4", amount = 99, at = "2024-05-02T09:00:00Z" },
      ]
    }
  }
  # In order: the upsert leaves the row of the last one.
  expect {
    sink = sink.orders_db
    messages = [
      { order_id = "o7", status = "created", customer_id = "c4", customer_name = "Barbara Liskov", tier = "silver", amount = 99, at = "2024-05-01T11:00:00Z" },
      { order_id = "o7", status = "paid", customer_id = "c4", customer_name = "Barbara Liskov", tier = "silver", amount = 99, at = "2024-05-01T11:05:00Z" },
      { order_id = "o7", status = "shipped", customer_id = "c4", customer_name = "Barbara Liskov", tier = "silver", amount = 99, at = "2024-05-02T09:00:00Z" },
    ]
  }
}
