# The sample export, end to end: what the job writes for it, line by line.

run "the sample export becomes clean orders" {
  send {
    source = source.export
    file   = "../data/orders.jsonl"
  }
  # One line per completed order with items, in the export's order for each customer. The golden
  # file was checked by hand; `flowrun test --update` rewrites it, so review any change to it.
  expect {
    sink = sink.clean
    file = "golden/orders-clean.jsonl"
  }
  # Of the 40 orders, 6 are pending, 5 cancelled and 2 completed without items.
  assert {
    condition     = metrics.completed.in == 40 && metrics.completed.filtered == 13
    error_message = "the filter keeps the 27 completed orders with items and drops the other 13"
  }
  assert {
    condition     = metrics.completed.dead_lettered == 0 && metrics.normalise.dead_lettered == 0
    error_message = "every order of the sample is well formed"
  }
}
