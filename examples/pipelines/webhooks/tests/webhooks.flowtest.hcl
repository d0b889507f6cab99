# What the shop's events become. The test sends them to the source as the HTTP server would pass
# them on, without HTTP: the requests' framing and refusals are the kind's own tests
# (stages/source_http_server_test.go).

variables {
  token = "test-token"
}

run "paid orders are enriched" {
  send {
    source = source.shop
    messages = [
      { event = "order.created", order_id = "1001", customer = "Alice", amount = "42.50", currency = "EUR" },
      { event = "order.paid", order_id = "1001", customer = " Alice ", amount = "42.50", currency = "EUR" },
      { event = "order.paid", order_id = "1002", customer = "bob", amount = "10", currency = "USD" },
    ]
  }
  expect {
    sink = sink.paid_orders
    messages = [
      { key = "1001", payload = { order_id = "1001", customer = "alice", currency = "EUR", amount_cents = 4250, vat_cents = 850 } },
      { key = "1002", payload = { order_id = "1002", customer = "bob", currency = "USD", amount_cents = 1000, vat_cents = 0 } },
    ]
  }
  assert {
    condition     = metrics.shop.out == 3 && metrics.paid.filtered == 1
    error_message = "the source writes every event, and the filter keeps the paid ones"
  }
}

run "an order in an unknown currency is dead-lettered" {
  send {
    source = source.shop
    messages = [
      { event = "order.paid", order_id = "1003", customer = "carol", amount = "5.00", currency = "JPY" },
      { event = "order.paid", order_id = "1004", customer = "dave", amount = "1.99", currency = "GBP" },
    ]
  }
  expect_dead_letters {
    stage    = stage.enrich
    count    = 1
    messages = [{ payload = { event = "order.paid", order_id = "1003", customer = "carol", amount = "5.00", currency = "JPY" }, attempts = 1 }]
  }
  expect {
    sink     = sink.paid_orders
    messages = [{ key = "1004", payload = { order_id = "1004", customer = "dave", currency = "GBP", amount_cents = 199, vat_cents = 40 } }]
  }
}
