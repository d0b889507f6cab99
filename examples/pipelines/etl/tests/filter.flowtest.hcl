# What the completed filter drops: any order that is not completed, and a completed one without
# items. Only the last order of each customer here gets through.

run "only completed orders with items get through" {
  send {
    source = source.export
    messages = [
      { id = 1, status = "pending", customer = { id = "c1", email = "a@example.com", country = "fr" }, items = [{ sku = "S-1", price = 2, qty = 1 }] },
      { id = 2, status = "cancelled", customer = { id = "c1", email = "a@example.com", country = "fr" }, items = [{ sku = "S-1", price = 2, qty = 1 }] },
      { id = 3, status = "completed", customer = { id = "c2", email = "b@example.com", country = "nl" }, items = [] },
      # A status is compared as written: "Completed" is not "completed".
      { id = 4, status = "Completed", customer = { id = "c2", email = "b@example.com", country = "nl" }, items = [{ sku = "S-1", price = 2, qty = 1 }] },
      # The && stops at the status: an order that is not completed needs no items field at all.
      { id = 5, status = "pending", customer = { id = "c2", email = "b@example.com", country = "nl" } },
      { id = 6, status = "completed", customer = { id = "c1", email = "a@example.com", country = "fr" }, items = [{ sku = "S-1", price = 2, qty = 1 }] },
      { id = 7, status = "completed", customer = { id = "c2", email = "b@example.com", country = "nl" }, items = [{ sku = "S-2", price = 1.5, qty = 4 }] },
    ]
  }
  expect {
    sink = sink.clean
    messages = [
      { key = "c1", payload = { order_id = "6", customer_id = "c1", email = "a@example.com", country = "FR", items = 1, total = 2, skus = "S-1" } },
      { key = "c2", payload = { order_id = "7", customer_id = "c2", email = "b@example.com", country = "NL", items = 1, total = 6, skus = "S-2" } },
    ]
  }
  assert {
    condition     = metrics.completed.filtered == 5 && metrics.completed.dead_lettered == 0
    error_message = "the filter drops the five other orders, and fails none"
  }
}

run "the clean record is normalised" {
  send {
    source = source.export
    messages = [
      # The email is trimmed and lower-cased, a null country becomes UNKNOWN, the total is the sum of
      # price times quantity, and the status and the internal note are not written.
      { id = 8, status = "completed", customer = { id = "c3", email = "  Carol@Example.COM ", country = null }, items = [{ sku = "S-1", price = 9.5, qty = 2 }, { sku = "S-2", price = 0.25, qty = 3 }], internal_note = "checked by ops" },
    ]
  }
  expect {
    sink = sink.clean
    messages = [
      { key = "c3", payload = { order_id = "8", customer_id = "c3", email = "carol@example.com", country = "UNKNOWN", items = 2, total = 19.75, skus = "S-1,S-2" } },
    ]
  }
}
