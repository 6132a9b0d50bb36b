(function (global) {
  'use strict';

  const DEFAULTS = Object.freeze({ selector: '[data-tabs]', activeClass: 'is-active', animate: true });

  function Tabs(root, options) {
    if (!(this instanceof Tabs)) return new Tabs(root, options);
    this.root = typeof root === 'string' ? document.querySelector(root) : root;
    this.options = Object.assign({}, DEFAULTS, options);
    this.tabs = Array.prototype.slice.call(this.root.querySelectorAll('[role="tab"]'));
    this.panels = this.tabs.map(function (tab) {
      return document.getElementById(tab.getAttribute('aria-controls'));
    });
    this._onClick = this._onClick.bind(this);
    this._onKeydown = this._onKeydown.bind(this);
    this.root.addEventListener('click', this._onClick);
    this.root.addEventListener('keydown', this._onKeydown);
    this.select(0);
  }

  Tabs.prototype.select = function (index) {
    var self = this;
    this.tabs.forEach(function (tab, i) {
      var selected = i === index;
      tab.setAttribute('aria-selected', String(selected));
      tab.tabIndex = selected ? 0 : -1;
      tab.classList.toggle(self.options.activeClass, selected);
      self.panels[i].hidden = !selected;
    });
    this.current = index;
  };

  Tabs.prototype._onClick = function (event) {
    var index = this.tabs.indexOf(event.target.closest('[role="tab"]'));
    if (index > -1) this.select(index);
  };

  Tabs.prototype._onKeydown = function (event) {
    var count = this.tabs.length;
    var keys = { ArrowLeft: -1, ArrowRight: 1, Home: -Infinity, End: Infinity };
    if (!(event.key in keys)) return;
    event.preventDefault();
    var delta = keys[event.key];
    var next = delta === -Infinity ? 0 : delta === Infinity ? count - 1 : (this.current + delta + count) % count;
    this.select(next);
    this.tabs[next].focus();
  };

  Tabs.prototype.destroy = function () {
    this.root.removeEventListener('click', this._onClick);
    this.root.removeEventListener('keydown', this._onKeydown);
  };

  global.Tabs = Tabs;
  if (typeof document !== 'undefined') {
    document.addEventListener('DOMContentLoaded', function () {
      document.querySelectorAll(DEFAULTS.selector).forEach(function (el) {
        el.__tabs = new Tabs(el);
      });
    });
  }
})(typeof window !== 'undefined' ? window : this);
