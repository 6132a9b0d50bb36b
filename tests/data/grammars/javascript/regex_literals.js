// Regular-expression literals beside divisions: the lexer reads a `/` by the parser's state.
var reTrim = /^\s+|\s+$/g;
var reIsHex = /^[-+]0x[0-9a-f]+$/i;
var reIsOctal = /^0o[0-7]+$/i;
var TOKEN_REGEXP = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
var match = /^(-?(?:\d+)?\.?\d+) *(milliseconds?|msecs?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d|weeks?|w|years?|yrs?|y)?$/i.exec(str);
var half = total / 2 / count;
var ratio = (a + b) / (c - d);
var parts = str.split(/[ ,]+/);
x /= 2;
if (/^\d+$/.test(value)) {
  value = value / 10;
}
function f(s) {
  return s.replace(/\\(.)/g, '$1') / 1;
}
var nested = /(a(b(c)?)*)+|(?:x|y){2,}?/gm;
var look = /(?<=\$)\d+(?!\.)/;
var unicode = /\u00e9[a-z]*/u;
var back = /(['"])\w*\1/;
var i = j++ / 2;
