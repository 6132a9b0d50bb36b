// Semicolon-free style (automatic semicolon insertion), as "standard" and many npm
// packages write it.
'use strict'

const path = require('path')
const { EventEmitter } = require('events')

let count = 0
let a = 1, b = 2
var total = a + b
  + count

const config = {
  name: 'demo',
  retries: 3
}

function clamp (x, lo, hi) {
  if (x < lo) return lo
  if (x > hi) return hi
  return x
}

function early (x) {
  if (!x) {
    return
  }
  return x
    .trim()
    .toLowerCase()
}

class Queue extends EventEmitter {
  items = []
  static limit = 10
  push (item) {
    this.items.push(item)
    this.emit('push', item)
  }
  get size () { return this.items.length }
}

const q = new Queue()
q.push(1)
q.push(2)

for (const item of q.items) console.log(item)

let i = 0
while (i < 3) i++
i
++count

do i-- 
while (i > 0)

const add = (x, y) => x + y
const value = add(1, 2)
  * 3

label: for (;;) {
  break label
}

outer: while (true) {
  continue outer
}

try {
  JSON.parse('{')
} catch (err) {
  count += 1
} finally {
  count -= 1
}

switch (count) {
  case 0:
    count = 1
    break
  default:
    count = 2
}

function thrower () {
  throw new Error('x')
}

const tpl = `count: ${count}`
module.exports = { clamp, early, Queue, add, value, path, tpl, config, total }
