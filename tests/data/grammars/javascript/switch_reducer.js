const initialState = { todos: [], filter: 'all', loading: false, error: null };

function todosReducer(state = initialState, action) {
  switch (action.type) {
    case 'todos/added': {
      const { id, text } = action.payload;
      return { ...state, todos: [...state.todos, { id, text, done: false }] };
    }
    case 'todos/toggled':
      return {
        ...state,
        todos: state.todos.map((todo) =>
          todo.id === action.payload ? { ...todo, done: !todo.done } : todo,
        ),
      };
    case 'todos/removed':
      return { ...state, todos: state.todos.filter(({ id }) => id !== action.payload) };
    case 'filter/changed':
      return { ...state, filter: action.payload };
    case 'todos/loading':
    case 'todos/reloading':
      return { ...state, loading: true, error: null };
    case 'todos/failed':
      return { ...state, loading: false, error: action.error.message };
    default:
      return state;
  }
}

function visibleTodos({ todos, filter }) {
  switch (filter) {
    case 'done':
      return todos.filter((t) => t.done);
    case 'active':
      return todos.filter((t) => !t.done);
    case 'all':
      break;
    default:
      throw new Error('unknown filter: ' + filter);
  }
  return todos;
}

let state = todosReducer(undefined, { type: '@@init' });
state = todosReducer(state, { type: 'todos/added', payload: { id: 1, text: 'write grammar' } });
state = todosReducer(state, { type: 'todos/toggled', payload: 1 });
console.log(visibleTodos(state));
