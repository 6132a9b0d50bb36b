const users = [
  { id: 1, name: 'Ada', age: 36, tags: ['admin', 'dev'] },
  { id: 2, name: 'Grace', age: 45, tags: ['dev'] },
  { id: 3, name: 'Linus', age: 28, tags: [] },
];

const adults = users.filter((u) => u.age >= 30);
const names = users.map(({ name }) => name.toUpperCase());
const totalAge = users.reduce((sum, { age }) => sum + age, 0);
const byId = Object.fromEntries(users.map((u) => [u.id, u]));
const allTags = [...new Set(users.flatMap((u) => u.tags))].sort();
const oldest = users.reduce((a, b) => (a.age > b.age ? a : b));
const hasAdmin = users.some((u) => u.tags.includes('admin'));
const everyoneNamed = users.every((u) => typeof u.name === 'string' && u.name.length > 0);
const sorted = [...users].sort((a, b) => a.name.localeCompare(b.name) || b.age - a.age);
const grouped = users.reduce((acc, user) => {
  const key = user.age < 30 ? 'young' : user.age < 40 ? 'middle' : 'senior';
  (acc[key] ||= []).push(user);
  return acc;
}, {});
const first = users.find((u) => u.id === 2)?.name ?? 'nobody';
const index = users.findIndex((u) => u.name.startsWith('L'));
const chunks = (arr, size) =>
  Array.from({ length: Math.ceil(arr.length / size) }, (_, i) => arr.slice(i * size, i * size + size));
const zip = (...arrays) => arrays[0].map((_, i) => arrays.map((a) => a[i]));

users.forEach((user, i) => {
  console.log(`${i + 1}. ${user.name} (${user.age})`);
});

console.log(adults.length, names.join(', '), totalAge, byId[1].name, allTags, oldest.name);
console.log(hasAdmin, everyoneNamed, sorted.map((u) => u.id), grouped, first, index);
console.log(chunks([1, 2, 3, 4, 5], 2), zip([1, 2], ['a', 'b']));
