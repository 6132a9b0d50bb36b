function quickSort(arr, compare = (a, b) => (a < b ? -1 : a > b ? 1 : 0)) {
  if (arr.length <= 1) return arr.slice();
  const [pivot, ...rest] = arr;
  const left = [], right = [];
  for (const x of rest) (compare(x, pivot) < 0 ? left : right).push(x);
  return [...quickSort(left, compare), pivot, ...quickSort(right, compare)];
}

function mergeSort(arr) {
  if (arr.length < 2) return arr;
  const mid = arr.length >>> 1;
  const left = mergeSort(arr.slice(0, mid));
  const right = mergeSort(arr.slice(mid));
  const out = [];
  let i = 0, j = 0;
  while (i < left.length && j < right.length) out.push(left[i] <= right[j] ? left[i++] : right[j++]);
  return out.concat(left.slice(i), right.slice(j));
}

function binarySearch(sorted, target) {
  let lo = 0, hi = sorted.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (sorted[mid] === target) return mid;
    if (sorted[mid] < target) lo = mid + 1;
    else hi = mid - 1;
  }
  return -(lo + 1);
}

function insertionSort(a) {
  for (let i = 1; i < a.length; i++) {
    const v = a[i];
    let j = i - 1;
    for (; j >= 0 && a[j] > v; j--) a[j + 1] = a[j];
    a[j + 1] = v;
  }
  return a;
}

function shuffle(arr, random = Math.random) {
  const a = [...arr];
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

const data = shuffle(Array.from({ length: 20 }, (_, i) => i * 3));
const sorted = mergeSort(data);
console.log(quickSort(data).join() === sorted.join(), binarySearch(sorted, 27), binarySearch(sorted, 28));
console.log(insertionSort([5, 2, 9, 1]), quickSort(['b', 'a', 'c'], (a, b) => b.localeCompare(a)));
